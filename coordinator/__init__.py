"""Metadata service and group coordinator."""
