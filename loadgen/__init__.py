"""`officellm bench`: an office-shaped load generator for any OpenAI-compatible chat server.

client   one streaming chat request -> RequestRecord (chunk times, the server's usage)
text     seeded filler text, documents and system prompts
scenarios office, long-doc, burst, shared-prefix: what each simulated user sends, and when
runner   runs a scenario under its bounds (requests, seconds) and scrapes /metrics around it
summary  the run's summary numbers (percentiles: app.percentiles)
report   the JSON document
plot     latency CDFs and throughput over time (matplotlib, Agg)
"""
