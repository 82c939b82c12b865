"""`dyntc serve`: the HTTP service over a classifier's model store."""
