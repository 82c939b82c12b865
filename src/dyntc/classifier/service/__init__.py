"""`dyntc serve`: the HTTP service over a classifier's model store.

Modules: :mod:`.app` (the routes, :func:`~.app.create_app`), :mod:`.service` (the classifier served,
writes, following other writers), :mod:`.access` (tokens, ``Origin`` and ``Host`` rules),
:mod:`.limits` (request bounds and the guards that hold them), :mod:`.server` (``run``)."""
