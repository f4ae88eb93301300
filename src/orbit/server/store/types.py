"""Column types that differ between MySQL/MariaDB and SQLite.

Migrations import these too, so a type change here must come with a migration.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text
from sqlalchemy.dialects import mysql

# 32 lowercase hex characters; ascii_bin keeps keys small and comparisons exact.
Id = String(32).with_variant(mysql.CHAR(32, charset="ascii", collation="ascii_bin"), "mysql", "mariadb")
# Names are case-sensitive on both backends (SQLite compares BINARY by default).
Name = String(128).with_variant(
    mysql.VARCHAR(128, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"
)
AsciiKey = String(128).with_variant(
    mysql.VARCHAR(128, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"
)
Short = String(64).with_variant(
    mysql.VARCHAR(64, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"
)
# A worker's node_id (1-128 printable ASCII characters, see core/ids.py).
NodeId = String(128).with_variant(
    mysql.VARCHAR(128, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"
)
# Naive UTC with microseconds.
Ts = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
U64 = BigInteger().with_variant(mysql.BIGINT(unsigned=True), "mysql", "mariadb")
U32 = Integer().with_variant(mysql.INTEGER(unsigned=True), "mysql", "mariadb")
# Autoincrement-friendly 64-bit key (SQLite only autoincrements INTEGER PRIMARY KEY).
Seq = BigInteger().with_variant(mysql.BIGINT(unsigned=True), "mysql", "mariadb").with_variant(
    Integer(), "sqlite"
)
Bool = Boolean(create_constraint=False)
JsonText = Text().with_variant(mysql.MEDIUMTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")
Utf8Text = Text().with_variant(mysql.TEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")
Hash = String(64).with_variant(mysql.CHAR(64, charset="ascii", collation="ascii_bin"), "mysql", "mariadb")
