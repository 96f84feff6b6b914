"""What happens to a transcript: knowledge-base matching, demand tags, entity extraction,
redaction, and the Redis publisher (at-least-once, journaled to disk before it is sent).

Never blocks the engine; receives events through a narrow queue interface.
"""
