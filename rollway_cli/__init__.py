"""`rollway`: the command line of a Rollway site, over its JSON API with a personal API
token (Authorization: Bearer rwp_…). Of the site it imports nothing and of the engine
only workers/core/merge.py (the `--set` grammar, standard library only), so `pip install
rollway` gives it with click, httpx, pyyaml and rich alone, on a laptop that only has the
URL and a token (tests/test_cli_install.py)."""
