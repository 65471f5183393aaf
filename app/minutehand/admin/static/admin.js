// What the admin pages do in the browser besides htmx, kept out of the
// HTML: the Content-Security-Policy runs no inline script or handler.
//
// A form, or the button that sends it, with data-confirm="question?" asks
// that question first; cancelled, nothing is sent.
document.addEventListener("submit", function (event) {
  var submitter = event.submitter;
  var asker = submitter && submitter.hasAttribute("data-confirm") ? submitter : event.target;
  var question = asker.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
