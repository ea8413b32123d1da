"""ragsim: what KV-cache, answer-cache and scheduling policies do to RAG serving.

The import arrow points one way: ``cli`` -> ``sim``/``realrun`` -> ``cache``, ``profiles``,
``traces``. The policy core (``ragsim.cache``) never imports a driver.
"""

__version__ = "0.1.0"
