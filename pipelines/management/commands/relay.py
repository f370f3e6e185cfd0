import asyncio

from django.core.management.base import BaseCommand

from pipelines.relay import Relay


class Command(BaseCommand):
    help = "Forward live runs' metrics and events from Redis to WebSocket clients and the DB."

    def handle(self, *args, **options):
        self.stdout.write("relay: following runs:live")
        try:
            asyncio.run(Relay().run_forever())
        except KeyboardInterrupt:
            pass
