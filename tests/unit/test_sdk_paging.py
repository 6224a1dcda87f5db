"""Lists are lazy iterators over the server's cursor pages (``live``): several requests for more items than a
page, nothing fetched before iterating, and ``limit`` stops early (the last request asks for what is left)."""

from __future__ import annotations

from tests.unit.sdk_helpers import sdk


def test_a_pager_follows_the_cursor_page_by_page_and_limit_stops_early(live):
    client = sdk(live)
    made = [
        client.jobs.submit({"workload": "digits", "name": f"job-{i}", "labels": {"team": "cv"}}).id for i in range(5)
    ]
    client.jobs.submit({"workload": "digits", "name": "other"})
    asked = []
    client.transport.http.event_hooks["request"].append(lambda request: asked.append(dict(request.url.params)))

    pager = client.jobs.list(labels={"team": "cv"}, page_size=2)
    assert asked == []  # lazy: nothing is fetched before the first item is wanted
    jobs = list(pager)
    assert [job.id for job in jobs] == made[::-1]  # newest first, every one, once
    assert pager.pages == 3 and len(asked) == 3
    assert [a.get("limit") for a in asked] == ["2", "2", "2"] and "cursor" not in asked[0] and asked[1]["cursor"]
    assert all(a["envelope"] == "true" for a in asked)  # the one scheme, not the deprecated bare lists

    asked.clear()
    limited = client.jobs.list(page_size=2, limit=3)
    assert [job.name for job in limited] == ["other", "job-4", "job-3"]
    assert limited.pages == 2 and [a["limit"] for a in asked] == ["2", "1"]  # never more than wanted

    asked.clear()
    assert client.jobs.list().first().name == "other" and asked[0]["limit"] == "1"


def test_every_list_pages_the_same_way(live):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})
    job.cancel()
    events = job.events(page_size=1)
    assert [(e.from_state, e.to_state) for e in events] == [(None, "QUEUED"), ("QUEUED", "CANCELLED")]
    assert events.pages == 2  # the second page came without a cursor: the last one
    assert len(list(client.projects.list(page_size=1))) == len(list(client.projects.list()))


def test_filters_by_state_and_name_prefix(live):
    client = sdk(live)
    kept = client.jobs.submit({"workload": "digits", "name": "bert-base"})
    client.jobs.submit({"workload": "digits", "name": "bert-large"}).cancel()
    assert [j.id for j in client.jobs.list(state="QUEUED", name_prefix="bert")] == [kept.id]
    assert len(list(client.jobs.list(state=["QUEUED", "CANCELLED"]))) == 2
    assert [j.name for j in client.jobs.list(name_prefix="bert-l")] == ["bert-large"]
