"""Root pytest configuration: what nbval must not collect."""

# Only book chapters and solution notebooks are compared by nbval. Exercise
# notebooks are stubs (they raise NotImplementedError by design), test fixtures
# are deliberately broken, and the build folder holds executed copies.
collect_ignore_glob = ["exercises/*", "tests/**/*.ipynb", "book/_build/*", "build/*"]
