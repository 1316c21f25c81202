"""`rollway`: the command line of a Rollway site, over its JSON API with a personal API
token (Authorization: Bearer rwp_…). It imports nothing of the site or the engine, so it
runs on a laptop that only has the URL and a token."""
