"""The shardspec contract: YAML documents, schema, loader, renderer, data model."""
