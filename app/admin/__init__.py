"""The admin web UI, served under /admin by the same Litestar app
(app/admin/app.py mounts it): server-rendered Jinja2 pages, htmx (vendored in
static/) for the live parts. access.py is the contract every page follows."""
