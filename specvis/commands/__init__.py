"""The commands of ``specvis`` (``specvis.cli`` parses and dispatches): each builds one ``Job`` from
its flags and runs it; ``flags`` holds what they share (method, sampling and device flags, loading)."""
