"""The app ``celery -A workers`` runs, built from the environment's settings."""

from config import load_settings
from workers.build import build

app, tasks = build(load_settings())
