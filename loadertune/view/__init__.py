"""What the user sees: the terminal summary, the live view of a search, and the HTML report
(:mod:`loadertune.view.html`).
"""
