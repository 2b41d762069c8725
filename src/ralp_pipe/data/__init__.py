"""The data layer: shard preparation (`shards`), the synthetic ImageNet twin (`synthetic`) and training loaders (`loaders`)."""
