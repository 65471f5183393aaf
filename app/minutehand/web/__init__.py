"""What the two HTTP apps, the API (app/minutehand/api/) and the admin UI
(app/minutehand/admin/), share as plumbing: the Context their handlers are
given (context.py), who is calling (auth.py: Principal, the token cache),
the kinds of refusal (problems.py) and admission control (admission.py).
Neither app imports the other; both import this. The rules they apply, the
CLI too, are in app/minutehand/rules.py."""
