"""Files and processes: bytes on disk read as untrusted input, strict JSON headers, the
protocols a format implements (`_source`) and the many-process save and sharded load.

The bottom of the checkpoint package: nothing here knows of trees or of any one format.
"""
