"""Files and processes, the bottom of the checkpoint package: nothing here knows of trees
or of any one format."""
