"""The bundle format: the file, its manifest schema and field checks, key rules, launch expressions, versions and installed bundle wheels. Imports no serving module."""
