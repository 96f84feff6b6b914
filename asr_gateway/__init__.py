"""Composition root of the service: configuration, logging, wiring and the command line."""
