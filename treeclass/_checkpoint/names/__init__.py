"""Names and rules: a tree as named checkpoint entries, checked against a catalog of what
a checkpoint holds, key rules and their compiled plan (load forwards, export backwards),
versions, treeclass's metadata document, and the restore that places what was read.

Reads checkpoints only through the protocols of `..files._source`: no format is named here.
"""
