// Render the formulas that pymdownx.arithmatex marks (generic mode) with the
// KaTeX shipped in docs/assets/katex, so the site needs no network.
document$.subscribe(() => {
  renderMathInElement(document.body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "$", right: "$", display: false },
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    ignoredClasses: ["highlight", "language-python"],
    throwOnError: false,
  });
});
