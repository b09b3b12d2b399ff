"""DMQ client library: Producer, DMQConsumer, SimpleConsumer, AdminClient."""
