"""The responder workers (SPEC §12), each built only on the public responder SDK
(:class:`toolnexus.Worker`, :class:`toolnexus.Service`); ``toolnexus worker NAME`` finds
them by their ``toolnexus.workers`` entry points.

**Delivery is at least once**: a request can reach a worker again after a crash, a
reconnect or a lapsed lease, so every worker here is idempotent.
"""
