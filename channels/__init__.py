"""Channel adapters: each translates one platform to and from the core's message types."""
