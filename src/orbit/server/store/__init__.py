"""Storage: table definitions, the transaction helper, dialect differences and queries."""
