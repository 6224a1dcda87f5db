"""The web dashboard under /ui: server-rendered Jinja2 pages and a little plain JavaScript over the same
services and repositories as the REST routers (docs/dashboard.md).

- ``mount``: ``install_ui(app)``, the /ui router (every page router is listed there) and /ui/static.
- ``secret``, ``session``: the server secret and the signed session cookie.
- ``auth``: who is signed in (``UiUserDep``), CSRF (``CsrfUser``) and members only (``UiMember``).
- ``templating``: ``render()``, every page's context (user, CSRF token, project switcher).
- ``live``: JSON answers with ETags (the pages poll them with If-None-Match).
- ``login``: sign-in, sign-out, the cluster admin's project switcher.
- ``jobs``, ``jobs_api``, ``job_views``: the jobs list and a job's page, their JSON, what they show.
"""
