"""Model loading, query streams, the decode loop and the trace (dpledger.decoding)."""
