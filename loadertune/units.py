"""Byte units, in one place: ``x / MIB`` reads as mebibytes wherever sizes are shown."""

MIB = 2**20
GIB = 2**30
