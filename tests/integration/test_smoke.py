import pytest

pytestmark = pytest.mark.anyio


async def test_create_replay_get(tenant):
    key = tenant.key()
    body = {"name": "images", "max_concurrency": 8, "rate_per_second": 100}
    r1 = await tenant.post("/v1/queues", body, key=key)
    assert r1.status_code == 201
    env = r1.json()
    assert env["request_id"] == r1.headers["x-request-id"]
    q = env["data"]["queue"]
    assert env["data"]["deduplicated"] is False
    assert q["max_unfinished_tasks"] == 100000 and q["revision"] == "1" and q["unfinished_tasks"] == "0"
    r2 = await tenant.post("/v1/queues", body, key=key)
    assert r2.status_code == 200 and r2.json()["data"] == {"deduplicated": True, "queue": q}
    r3 = await tenant.get(f"/v1/queues/{q['id']}")
    assert r3.status_code == 200 and r3.json()["data"] == q
