"""The wire contract: what clients and servers share about the wire (DESIGN.md "Layout").

The gRPC messages and services (dmq.proto, dmq_pb2, dmq_pb2_grpc), the record-batch codec
(records), hand framing (wire), name rules and limits (names, limits, topic_settings, values),
offset markers, error reasons (error_details), event headers, trace context, message size limits
(grpc_options) and the security both sides build channels with (security/). What only the two
servers run (interceptors, the error mapping, the data-dir lock, metrics) is dmq.proto.server,
which the client library never imports.
"""
