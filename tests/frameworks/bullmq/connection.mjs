// The ioredis connection options for a suite URL (suite.mjs, stalled-worker.mjs).
//
// redis://HOST:PORT gives { host, port }, as the suites always used. Two additions, for
// tests/frameworks/secure/run.sh:
//   - user:password@ in the URL: ioredis sends AUTH user password (ACL users);
//   - the rediss:// scheme: TLS, with the PEM files named by KITE_TLS_CA (the CA that
//     signed the server's certificate), KITE_TLS_CERT and KITE_TLS_KEY (the client's
//     certificate and key), each when set.
import { readFileSync } from 'node:fs';

export function connectionFor(url) {
    const u = new URL(url);
    const connection = { host: u.hostname, port: Number(u.port) };
    if (u.username) connection.username = decodeURIComponent(u.username);
    if (u.password) connection.password = decodeURIComponent(u.password);
    if (u.protocol === 'rediss:') {
        const tls = {};
        for (const [opt, env] of [
            ['ca', 'KITE_TLS_CA'],
            ['cert', 'KITE_TLS_CERT'],
            ['key', 'KITE_TLS_KEY'],
        ]) {
            if (process.env[env]) tls[opt] = readFileSync(process.env[env]);
        }
        connection.tls = tls;
    }
    return connection;
}
