"""The `dmq` Python data source: `spark.read` / `spark.readStream` / `df.write` / `writeStream`.

Spark pickles this object (its options only) into its Python workers; readers and writers open
their own gRPC channels where they run. Options are checked when a reader or writer is made, so a
mistake fails the query before any task starts (see dmq.client.spark.options for the list).
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from dmq.client.spark._worker import prepare_worker
from dmq.client.spark.arrow import source_schema
from dmq.client.spark.options import OptionError, parse_sink_options, parse_source_options

__all__ = ["DMQDataSource"]


class DMQDataSource(DataSource):
    """Short name `dmq`. Output schema as Spark's Kafka source (plus `headers` on request)."""

    @classmethod
    def name(cls) -> str:
        return "dmq"

    def _include_headers(self) -> bool:
        raw = str(self.options.get("includeheaders", self.options.get("includeHeaders", "false"))).strip().lower()
        if raw not in ("true", "false"):
            raise OptionError(f"option 'includeHeaders' must be 'true' or 'false', got {raw!r}")
        return raw == "true"

    def schema(self) -> StructType:
        prepare_worker()  # Spark calls this first, in the worker that creates the source
        return source_schema(self._include_headers())

    def _check_schema(self, schema: StructType) -> None:
        expected = self.schema()
        if schema != expected:
            raise OptionError(
                f"the dmq source has a fixed schema and does not take a user schema: expected "
                f"{expected.simpleString()}, got {schema.simpleString()} (drop .schema(...) and select/cast "
                f"the columns instead)"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        from dmq.client.spark.reader import DMQBatchReader

        prepare_worker()
        opts = parse_source_options(self.options, streaming=False)
        self._check_schema(schema)
        return DMQBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from dmq.client.spark.reader import DMQStreamReader

        prepare_worker()
        opts = parse_source_options(self.options, streaming=True)
        self._check_schema(schema)
        return DMQStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from dmq.client.spark.sink import DMQWriter, check_sink_schema

        if overwrite:
            raise OptionError(
                "save mode 'overwrite' is not supported by the dmq sink: a topic is append-only; "
                "use mode('append')"
            )
        prepare_worker()
        opts = parse_sink_options(self.options)
        check_sink_schema(schema, opts)
        return DMQWriter(opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from dmq.client.spark.sink import DMQStreamWriter, check_sink_schema

        if overwrite:
            raise OptionError("output mode 'complete' is not supported by the dmq sink; use 'append' or 'update'")
        prepare_worker()
        opts = parse_sink_options(self.options)
        check_sink_schema(schema, opts)
        return DMQStreamWriter(opts, schema)
