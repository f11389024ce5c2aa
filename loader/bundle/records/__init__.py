"""The bundle format's launch records, one module per runtime (what an entry's `launch` object holds)."""
