import js from '@eslint/js';
import jupyter from '@jupyter/eslint-plugin';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: ['node_modules', 'lib', 'coverage', '**/*.js', '**/*.d.ts', '.venv']
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  ...jupyter.configs.recommended,
  {
    files: ['src/**/*.{ts,tsx}'],
    languageOptions: {
      globals: { ...globals.browser, ...globals.jest },
      parserOptions: { project: './tsconfig.test.json' }
    },
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        {
          selector: 'interface',
          format: ['PascalCase'],
          custom: { regex: '^I[A-Z]', match: true }
        }
      ],
      '@typescript-eslint/no-unused-vars': ['warn', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error',
      // English only for now: no translation bundle to wrap strings in.
      'jupyter/no-untranslated-string': 'off'
    }
  },
  {
    // the dashboard's module is loaded alone (from the kernel or the server): it imports nothing
    files: ['src/widget/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['*'],
              allowTypeImports: true,
              message:
                'workbench/widgets/dashboard.js is loaded as one ES module: it may import types only.'
            }
          ]
        }
      ]
    }
  }
);
