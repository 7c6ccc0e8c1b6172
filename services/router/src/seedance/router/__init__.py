"""Seedance."""
