"""Local fake servers that speak real wire protocols, for driving the real SDKs in tests."""
