"""The queues: kombu topology, the publisher and its outbox, the decision log, the Redis
transport and the event stream. Each module is imported by its own name
(`events.publisher`, `events.stream`, ...)."""
