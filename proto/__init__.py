"""The wire contract: gRPC messages and services (dmq_pb2, dmq_pb2_grpc) and the record-batch codec."""
