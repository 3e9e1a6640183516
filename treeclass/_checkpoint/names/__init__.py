"""Names and rules: a tree against a checkpoint, read through `..files._source`'s
protocols only (no format is named here)."""
