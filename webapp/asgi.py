"""ASGI entry point: HTTP through Django (static files served here too, so one daphne
process is the whole web tier on a developer machine), WebSockets through Channels
with the session's user."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from webapp.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": ASGIStaticFilesHandler(django_asgi),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
