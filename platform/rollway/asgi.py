"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Run with `PYTHONPATH=platform:. daphne -b 127.0.0.1 -p 8000 rollway.asgi:application`.
"""

import os
import sys
from pathlib import Path

_PLATFORM_DIR = Path(__file__).resolve().parents[1]
for _path in (str(_PLATFORM_DIR), str(_PLATFORM_DIR.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from runs.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
