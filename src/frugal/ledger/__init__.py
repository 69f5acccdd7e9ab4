"""The books: every plan and run, what it was predicted and what it cost, in one database
(SQLite by default, any SQLAlchemy URL through FRUGAL_DB_URL)."""
