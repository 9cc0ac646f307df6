"""The Python peers on the same Redis: a worker process returns a value to an awaiting caller.

Each peer has a caller-side case (``<peer>_case.py``) and the worker-side code
its worker imports (``apps.py``); ``proc.py`` starts and stops worker processes.
"""
