"""A batch of events is one row: its events are a JSON array in `event_batches.events`.

Every event was a row of its own in `events`, with an auto-increment key and a second index:
four rows per successful task (submitted, leased, started, succeeded), which made up four of the
seven rows a task's lifecycle wrote and a third of the SQL text a drain sent to the database.
A write's events of one namespace already formed a batch, numbered as one by the sequencer and
read back whole by the feed; the batch row now carries them, each as
`[type, time, resource_type, resource_id, data]`, and the `events` table goes. Existing events
are copied into their batches in order, a page of batches at a time.

Revision ID: 000017
Revises: 000016
"""

import orjson
import sqlalchemy as sa
from alembic import op

from orbit.server.core.timefmt import format_ts
from orbit.server.store.types import JsonText, Ts

revision = "000017"
down_revision = "000016"
branch_labels = None
depends_on = None

PAGE = 500

batches = sa.table("event_batches", sa.column("batch_id"), sa.column("events"))
events = sa.table("events", sa.column("id"), sa.column("batch_id"), sa.column("type"), sa.column("time", Ts),
                  sa.column("resource_type"), sa.column("resource_id"), sa.column("data"))


def upgrade() -> None:
    op.add_column("event_batches", sa.Column(
        "events", JsonText, nullable=True,
        comment="the batch's events in seq order: a JSON array of [type, time, resource_type, resource_id, data]"))
    bind = op.get_bind()
    last = ""
    while True:
        ids = list(bind.execute(sa.select(batches.c.batch_id).where(batches.c.batch_id > last)
                                .order_by(batches.c.batch_id).limit(PAGE)).scalars())
        if not ids:
            break
        bodies: dict[str, list] = {i: [] for i in ids}
        for r in bind.execute(sa.select(events).where(events.c.batch_id.in_(ids))
                              .order_by(events.c.batch_id, events.c.id)).mappings():
            # The stored shape as of this revision, spelled out rather than taken from the store's
            # `events.body`, so that a later change there cannot change what this step writes.
            bodies[r["batch_id"]].append([r["type"], format_ts(r["time"]), r["resource_type"], r["resource_id"],
                                          orjson.Fragment(r["data"])])
        bind.execute(sa.update(batches).where(batches.c.batch_id == sa.bindparam("b_id"))
                     .values(events=sa.bindparam("b_events")),
                     [{"b_id": i, "b_events": orjson.dumps(evs).decode()} for i, evs in bodies.items()])
        last = ids[-1]
    op.drop_table("events")


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
