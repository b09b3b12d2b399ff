"""The coordinator's metadata store: one interface (base.MetadataStore), two backends (SQLite in
dmq.coordinator.store, etcd in etcd.py), chosen by a URL (config.make_metadata_store)."""
