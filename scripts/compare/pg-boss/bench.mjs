// pg-boss on the same PostgreSQL as `herald bench engine`, for the
// comparison in the book's benchmarks: N jobs (one per message: an
// account and a group) inserted up front, then WORKERS workers taking
// BATCH jobs at a time complete them. Prints jobs a second for the
// processing alone and with the inserts. Run beside Herald's:
//   npm ci && DB=postgres://… node bench.mjs
//   herald bench engine --db postgres://… --accounts 100 --groups 1000
import PgBoss from 'pg-boss';
import pg from 'pg';

const url = process.env.DB || 'postgres://postgres@127.0.0.1:5432/test';
const N = +(process.env.N || 100000);
const WORKERS = +(process.env.WORKERS || 16);
const BATCH = +(process.env.BATCH || 500);
const schema = 'pgboss_bench';

const admin = new pg.Client({ connectionString: url });
await admin.connect();
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
const boss = new PgBoss({ connectionString: url, schema, max: WORKERS + 4 });
boss.on('error', e => console.error(e));
await boss.start();
const queue = 'reminder';
await boss.createQueue(queue);

const t0 = performance.now();
for (let i = 0; i < N; i += 1000) {
  const jobs = [];
  for (let j = i; j < Math.min(N, i + 1000); j++) {
    jobs.push({ name: queue, data: { account: `bench-${j % 100}`, group: `g${j}` } });
  }
  await boss.insert(jobs);
}
const t1 = performance.now();
let seen = 0;
for (let w = 0; w < WORKERS; w++) {
  await boss.work(queue, { batchSize: BATCH, pollingIntervalSeconds: 0.5 }, async jobs => {
    seen += jobs.length;
  });
}
// Handlers count what they took; only then ask the database (a count over
// the job table every few ms would itself slow pg-boss down).
while (seen < N) await new Promise(r => setTimeout(r, 5));
for (;;) {
  const r = await admin.query(
    `SELECT count(*)::int AS n FROM ${schema}.job WHERE name = $1 AND state = 'completed'`,
    [queue],
  );
  if (r.rows[0].n >= N) break;
  await new Promise(r => setTimeout(r, 5));
}
const t2 = performance.now();
const s = ms => (ms / 1000).toFixed(3);
console.log(
  `pg-boss: jobs=${N} workers=${WORKERS} batch=${BATCH} insert_s=${s(t1 - t0)} ` +
    `process_s=${s(t2 - t1)} jobs_per_s=${(N / ((t2 - t1) / 1000)).toFixed(0)} ` +
    `with_insert_jobs_per_s=${(N / ((t2 - t0) / 1000)).toFixed(0)}`,
);
await boss.stop({ graceful: false, wait: false });
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await admin.end();
process.exit(0);
