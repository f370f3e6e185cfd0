from django.urls import path

from webapp.consumers import RunConsumer

websocket_urlpatterns = [path("ws/runs/<int:run_id>/", RunConsumer.as_asgi())]
