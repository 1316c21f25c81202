"""What every app of the site stands on, and which uses none of them: the actions layer's
errors, strict readers of input (environment variables, JSON bodies, query parameters),
the JSON error answers, the request guards of the middleware stack and the adapters the
settings plug in (channel layer, broker transport, static files).

The floors above it: teams (who may do what), configs, runs, compare, then the surfaces
(dashboard, api, ops) and the Django project package `rollway` as the roof
(tests/test_layers.py holds every import to that order).
"""
