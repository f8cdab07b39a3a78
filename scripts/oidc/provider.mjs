// The demo's and the tests' OpenID provider: the certified `oidc-provider` package with four demo identities
// (alice, bob, carol, dana; password $DEMO_PASSWORD, default "demo"), a `groups` claim, and the portal as a
// confidential client that must use PKCE (S256). Started by scripts/oidc.sh (make demo) and by the tests.
//
// Environment:
//   OIDC_PROVIDER_HOST, OIDC_PROVIDER_PORT   where it listens (127.0.0.1, 8300); the issuer is http://HOST:PORT
//   OIDC_CLIENTS      JSON list of clients: {client_id, client_secret, redirect_uris, post_logout_redirect_uris,
//                     id_token_ttl_seconds (optional, default 3600), grant_types (optional, default
//                     ["authorization_code"]; ["client_credentials"] for a machine identity such as a CI pipeline),
//                     access_token_ttl_seconds (optional, default 600: the JWT access tokens for an API)}
//   OIDC_API_RESOURCES  JSON list of APIs (resource indicators, RFC 8707) the provider issues JWT access tokens for
//                     (scope `api`, audience the resource), e.g. ["http://127.0.0.1:8000/api"]; default none
//   OIDC_IDENTITIES_FILE  optional JSON file {username: {claim: value, ...}} read at each sign-in: claims that
//                     replace the built-in ones (null removes one), so a person's groups can change while it runs;
//                     a `uid` set there is released with the profile scope (a POSIX user name other than the login)
//   DEMO_PASSWORD     the demo identities' password
//
// Keys (signing and cookie) are made anew at each start: a restart signs everyone out of the provider, which a
// demo can afford. Nothing here is fit to be a production identity provider; the portal's side is.
import { generateKeyPairSync, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { URLSearchParams } from 'node:url';

import Provider, { errors } from 'oidc-provider';

const host = process.env.OIDC_PROVIDER_HOST || '127.0.0.1';
const port = Number(process.env.OIDC_PROVIDER_PORT || 8300);
const issuer = `http://${host}:${port}`;
const password = process.env.DEMO_PASSWORD || 'demo';
const clients = JSON.parse(process.env.OIDC_CLIENTS || '[]');
const apiResources = JSON.parse(process.env.OIDC_API_RESOURCES || '[]');
const identitiesFile = process.env.OIDC_IDENTITIES_FILE;
if (clients.length === 0) {
  console.error('OIDC_CLIENTS names no client: give the portal\'s client id, secret and redirect URIs');
  process.exit(2);
}

// The demo's people: the portal's demo users (same e-mail addresses as `manage.py seed_demo`) and dana, whom the
// portal has never seen, for the first sign-in that creates an account.
const IDENTITIES = {
  alice: { name: 'Alice Archer', given_name: 'Alice', family_name: 'Archer', groups: ['acme-admins'] },
  bob: { name: 'Bob Baker', given_name: 'Bob', family_name: 'Baker', groups: ['acme-vision-members'] },
  carol: { name: 'Carol Cruz', given_name: 'Carol', family_name: 'Cruz', groups: ['globex-admins'] },
  dana: { name: 'Dana Diaz', given_name: 'Dana', family_name: 'Diaz', groups: ['acme-vision-members'] },
};

function changedClaimsOf(username) {
  if (!identitiesFile) return {};
  try {
    return JSON.parse(readFileSync(identitiesFile, 'utf8'))[username] || {};
  } catch (error) {
    if (error.code === 'ENOENT') return {};
    throw error;
  }
}

function claimsOf(username) {
  const claims = { ...builtInClaimsOf(username), ...changedClaimsOf(username) };
  return Object.fromEntries(Object.entries(claims).filter(([, value]) => value !== null));
}

function builtInClaimsOf(username) {
  const person = IDENTITIES[username];
  return {
    sub: username,
    preferred_username: username,
    name: person.name,
    given_name: person.given_name,
    family_name: person.family_name,
    email: `${username}@example.org`,
    email_verified: true,
    groups: person.groups,
  };
}

function passwordMatches(given) {
  const expected = Buffer.from(password);
  const actual = Buffer.from(String(given ?? ''));
  return actual.length === expected.length && timingSafeEqual(actual, expected);
}

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: randomBytes(8).toString('hex'), use: 'sig', alg: 'RS256' };
const idTokenTtl = Object.fromEntries(clients.map((client) => [client.client_id, client.id_token_ttl_seconds || 3600]));
const accessTokenTtl = Object.fromEntries(clients.map((client) => [client.client_id, client.access_token_ttl_seconds || 600]));

const provider = new Provider(issuer, {
  clients: clients.map((client) => ({
    client_id: client.client_id,
    client_secret: client.client_secret,
    redirect_uris: client.redirect_uris,
    post_logout_redirect_uris: client.post_logout_redirect_uris || [],
    grant_types: client.grant_types || ['authorization_code'],
    response_types: (client.grant_types || ['authorization_code']).includes('authorization_code') ? ['code'] : [],
    token_endpoint_auth_method: 'client_secret_post',
  })),
  pkce: { required: () => true },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    // `uid`, the person's POSIX user as an LDAP-backed directory releases it, only when OIDC_IDENTITIES_FILE sets it.
    profile: ['preferred_username', 'name', 'given_name', 'family_name', 'uid'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  // The ID token carries the claims too, not only the userinfo endpoint.
  conformIdTokenClaims: false,
  ttl: { IdToken: (ctx, token, client) => idTokenTtl[client.clientId] || 3600 },
  jwks: { keys: [signingKey] },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true, logoutSource, postLogoutSuccessSource },
    clientCredentials: { enabled: true },
    // Access tokens for an API in OIDC_API_RESOURCES are JWTs the API checks itself (issuer, audience, expiry,
    // signature against this provider's JWKS); without a resource, the access token is for userinfo only.
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      getResourceServerInfo(ctx, resourceIndicator, client) {
        if (!apiResources.includes(resourceIndicator)) throw new errors.InvalidTarget();
        return {
          scope: 'api',
          audience: resourceIndicator,
          accessTokenFormat: 'jwt',
          accessTokenTTL: accessTokenTtl[client.clientId] || 600,
        };
      },
    },
  },
  // Who a JWT access token is for, by name: the person, or the machine identity (client) itself.
  async extraTokenClaims(ctx, token) {
    return { preferred_username: token.accountId || token.clientId };
  },
  async findAccount(ctx, sub) {
    if (!IDENTITIES[sub]) return undefined;
    return { accountId: sub, claims: async () => claimsOf(sub) };
  },
  // The portal is this provider's own client: no consent screen, every scope it asks for is granted.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid profile email groups');
    for (const resource of [ctx.oidc.params.resource || []].flat()) {
      if (apiResources.includes(resource)) grant.addResourceScope(resource, 'api');
    }
    await grant.save();
    return grant;
  },
  renderError: async (ctx, out) => {
    ctx.type = 'html';
    ctx.body = page('Sign-in problem', `<p>${escape(out.error)}: ${escape(out.error_description || '')}</p>`);
  },
});

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

function page(title, body) {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(title)} · Demo identity provider</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>${escape(title)}</h1><p><em>Demo identity provider of the GPU portal (not for production)</em></p>${body}</main></body></html>`;
}

function loginPage(uid, clientName, error) {
  const problem = error ? `<p role="alert">${escape(error)}</p>` : '';
  return page('Sign in', `<p>to ${escape(clientName)}</p>${problem}
<form method="post" action="/interaction/${escape(uid)}/login">
<p><label for="username">Username</label> <input id="username" name="username" autocomplete="username" required autofocus></p>
<p><label for="password">Password</label> <input id="password" name="password" type="password" autocomplete="current-password" required></p>
<p><button type="submit">Sign in</button></p>
</form>
<p>Demo people: alice, bob, carol, dana.</p>`);
}

async function logoutSource(ctx, form) {
  ctx.body = page('Sign out', `<p>Sign out of the demo identity provider as well?</p>${form}
<button type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button>`);
}

async function postLogoutSuccessSource(ctx) {
  ctx.body = page('Signed out', '<p>You are signed out of the demo identity provider.</p>');
}

function readForm(req) {
  return new Promise((resolve, reject) => {
    let body = '';
    req.on('data', (chunk) => {
      body += chunk;
      if (body.length > 10_000) req.destroy();
    });
    req.on('end', () => resolve(new URLSearchParams(body)));
    req.on('error', reject);
  });
}

function send(res, status, html) {
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
  res.end(html);
}

// The sign-in page: the one interaction this provider has (consent is granted by loadExistingGrant above).
async function interaction(req, res) {
  const [, , uid, action] = new URL(req.url, issuer).pathname.split('/');
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) return send(res, 400, page('Sign-in problem', '<p>This sign-in has expired; start again.</p>'));
  const client = await provider.Client.find(details.params.client_id);
  const clientName = client?.clientName || details.params.client_id;
  if (req.method === 'GET') return send(res, 200, loginPage(uid, clientName));
  if (req.method === 'POST' && action === 'login') {
    const form = await readForm(req);
    const username = form.get('username') || '';
    if (!Object.hasOwn(IDENTITIES, username) || !passwordMatches(form.get('password'))) {
      return send(res, 401, loginPage(uid, clientName, 'Wrong username or password.'));
    }
    return provider.interactionFinished(req, res, { login: { accountId: username } }, { mergeWithLastSubmission: false });
  }
  return send(res, 405, page('Sign-in problem', '<p>Not here.</p>'));
}

const callback = provider.callback();
const server = http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((error) => send(res, 400, page('Sign-in problem', `<p>${escape(error.message)}</p>`)));
    return;
  }
  callback(req, res);
});
server.listen(port, host, () => console.log(`OpenID provider ${issuer} for ${clients.map((c) => c.client_id).join(', ')}`));
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
