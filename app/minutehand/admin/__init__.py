"""The admin web UI, served under /admin by the same Litestar app
(app/minutehand/serve.py hands app/minutehand/admin/app.py's admin_ui to create_app): server-rendered Jinja2 pages, htmx (vendored in
static/) for the live parts. app.py's docstring is the contract every page
follows; access.py has what they share (who is signed in, rendering, audit)."""
