"""Peer task queues measured side by side with Orbit: Celery 5 (Redis broker) and Procrastinate (PostgreSQL)."""
