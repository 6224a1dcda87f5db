"""Repository functions take a session and never commit: the caller owns the transaction."""
