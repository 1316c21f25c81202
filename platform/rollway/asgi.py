"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Run with `PYTHONPATH=platform:. daphne -b 127.0.0.1 -p 8000 rollway.asgi:application`.
"""

import os
import sys
from pathlib import Path

from django.core.asgi import get_asgi_application

_PLATFORM_DIR = Path(__file__).resolve().parents[1]
for _path in (str(_PLATFORM_DIR), str(_PLATFORM_DIR.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")


def _application():
    # Django must be set up before anything imports models (the consumers do), so the
    # WebSocket side is imported only after get_asgi_application().
    django_asgi_app = get_asgi_application()

    from channels.auth import AuthMiddlewareStack
    from channels.routing import ProtocolTypeRouter, URLRouter
    from channels.security.websocket import AllowedHostsOriginValidator

    from runs.routing import websocket_urlpatterns

    return ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )


application = _application()
