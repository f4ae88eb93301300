"""Named queries, one module per aggregate. Every SQL statement of the server lives here.

A query is a plain function returning a `Stmt` (text written once for both backends with `?`
placeholders and the dialect tokens of `store/tx.py`); the few operations that must decide
how to write on each backend (guarded UPDATEs, set-based updates) are async functions taking
the transaction. Services combine statements into round trips (`tx.rows_multi`) and never
hold SQL text.
"""
